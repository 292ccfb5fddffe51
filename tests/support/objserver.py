#!/usr/bin/env python3
"""A small object server for packfs's tests and benchmarks: serves the files under --root over
HTTP/1.1 (HEAD, GET with Range, ETag and If-Match, Last-Modified), or forwards every request to
--upstream (an S3 server such as moto) unchanged. Either way it counts requests and bytes and
injects faults and latency on command, so tests can see what packfs asked for.

Control (on the same port, never forwarded):
  GET /_stats                   -> {"requests": N, "gets": N, "heads": N, "bytes": N, "connections": N,
                                    "max_in_flight": N, "by_path": {...}}
  GET /_reset                   -> zero the counters
  GET /_fault?status=503&count=3&match=shard   the next 3 matching requests answer 503
  GET /_fault?stall=5&count=1&match=shard      the next matching request waits 5 s, then answers
  GET /_fault?deny=shard        every matching request answers 403 (until /_fault?clear=1)
  GET /_fault?clear=1           no faults
  GET /_latency?ms=20&bps=0     per-request latency, and a bandwidth cap in bytes/s (0: none)

Prints "PORT <n>" on stdout once listening (port 0 picks a free one).
"""

import argparse
import email.utils
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATS = {"requests": 0, "gets": 0, "heads": 0, "lists": 0, "bytes": 0, "by_path": {}, "max_in_flight": 0, "connections": 0}
IN_FLIGHT = [0]
FAULTS = {"status": None, "stall": None, "count": 0, "match": "", "deny": None}
LATENCY = {"ms": 0.0, "bps": 0}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def setup(self):
        super().setup()
        with LOCK:
            STATS["connections"] += 1

    def control(self, path, query):
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}
        with LOCK:
            if path == "/_stats":
                body = json.dumps(STATS).encode()
            elif path == "/_reset":
                STATS.update(requests=0, gets=0, heads=0, lists=0, bytes=0, by_path={}, max_in_flight=0, connections=0)
                body = b"{}"
            elif path == "/_fault":
                if "clear" in q:
                    FAULTS.update(status=None, stall=None, count=0, match="", deny=None)
                if "deny" in q:
                    FAULTS["deny"] = q["deny"]
                if "status" in q:
                    FAULTS.update(status=int(q["status"]), stall=None)
                if "stall" in q:
                    FAULTS.update(stall=float(q["stall"]), status=None)
                if "count" in q:
                    FAULTS["count"] = int(q["count"])
                FAULTS["match"] = q.get("match", FAULTS["match"])
                body = json.dumps(FAULTS).encode()
            elif path == "/_latency":
                LATENCY["ms"] = float(q.get("ms", 0))
                LATENCY["bps"] = int(q.get("bps", 0))
                body = json.dumps(LATENCY).encode()
            else:
                body = b"unknown control"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def fault(self, path):
        """The fault this request meets: ('status', n), ('stall', s), ('deny', _) or None."""
        with LOCK:
            if FAULTS["deny"] and FAULTS["deny"] in path:
                return ("deny", 403)
            if FAULTS["count"] > 0 and FAULTS["match"] in path:
                FAULTS["count"] -= 1
                if FAULTS["status"]:
                    return ("status", FAULTS["status"])
                if FAULTS["stall"]:
                    return ("stall", FAULTS["stall"])
        return None

    def count(self, path, method, nbytes):
        with LOCK:
            STATS["requests"] += 1
            if method == "GET" and "list-type" in self.path:
                STATS["lists"] += 1
            elif method == "GET":
                STATS["gets"] += 1
            elif method == "HEAD":
                STATS["heads"] += 1
            STATS["bytes"] += nbytes
            entry = STATS["by_path"].setdefault(path, [0, 0])
            entry[0] += 1
            entry[1] += nbytes

    def send_error_status(self, status):
        body = b"<Error><Code>InjectedFault</Code></Error>"
        self.send_response(status)
        if status == 403:
            self.send_header("x-amz-error-code", "AccessDenied")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        parsed = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(parsed.path)
        if path.startswith("/_"):
            return self.control(path, parsed.query)
        with LOCK:
            IN_FLIGHT[0] += 1
            STATS["max_in_flight"] = max(STATS["max_in_flight"], IN_FLIGHT[0])
        try:
            self.serve_request(path)
        finally:
            with LOCK:
                IN_FLIGHT[0] -= 1

    def serve_request(self, path):
        if LATENCY["ms"]:
            time.sleep(LATENCY["ms"] / 1000)
        fault = self.fault(path)
        if fault and fault[0] == "stall":
            time.sleep(fault[1])
        if fault and fault[0] in ("status", "deny"):
            self.count(path, self.command, 0)
            return self.send_error_status(fault[1])
        if ARGS.upstream:
            return self.forward(path)
        return self.serve_file(path)

    def forward(self, path):
        up = urllib.parse.urlsplit(ARGS.upstream)
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        self.count(path, self.command, len(data))
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length", "server", "date"):
                self.send_header(k, v)
        # A HEAD's length is the object's, not its (empty) body's.
        length = resp.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", length or str(len(data)))
        self.end_headers()
        self.write_body(data)
        conn.close()

    def write_body(self, data):
        if self.command == "HEAD" or not data:
            return
        bps = LATENCY["bps"]
        if not bps:
            self.wfile.write(data)
            return
        piece = max(bps // 100, 4096)
        for at in range(0, len(data), piece):
            self.wfile.write(data[at:at + piece])
            time.sleep(len(data[at:at + piece]) / bps)

    def serve_file(self, path):
        full = os.path.realpath(os.path.join(ARGS.root, path.lstrip("/")))
        if not full.startswith(os.path.realpath(ARGS.root) + os.sep) or not os.path.isfile(full):
            self.count(path, self.command, 0)
            return self.send_error_status(404)
        st = os.stat(full)
        etag = '"%x-%x"' % (st.st_size, st.st_mtime_ns)
        match = self.headers.get("If-Match")
        if match and match != etag:
            self.count(path, self.command, 0)
            return self.send_error_status(412)
        size = st.st_size
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            start = int(first)
            end = min(int(last), size - 1) if last else size - 1
            if start >= size:
                self.count(path, self.command, 0)
                return self.send_error_status(416)
            status = 206
        with open(full, "rb") as f:
            f.seek(start)
            data = f.read(end - start + 1) if self.command == "GET" else b""
        self.count(path, self.command, len(data))
        self.send_response(status)
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        self.write_body(data)

    do_GET = handle_any
    do_HEAD = handle_any
    do_PUT = handle_any
    do_POST = handle_any
    do_DELETE = handle_any


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--root")
    parser.add_argument("--upstream")
    parser.add_argument("--port", type=int, default=0)
    ARGS = parser.parse_args()
    if not (ARGS.root or ARGS.upstream):
        sys.exit("give --root DIR or --upstream URL")
    server = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    server.daemon_threads = True
    print("PORT", server.server_address[1], flush=True)
    server.serve_forever()
