#!/usr/bin/env python3
"""A small object server for packfs's tests and benchmarks: serves the files under --root over
HTTP/1.1 (HEAD, GET with Range, ETag and If-Match, Last-Modified), or forwards every request to
--upstream (an S3 server such as moto) unchanged. Either way it counts requests and bytes and
injects faults and latency on command, so tests can see what packfs asked for.

Control (on the same port, never forwarded):
  GET /_stats                   -> {"requests": N, "gets": N, "heads": N, "bytes": N, "connections": N,
                                    "max_in_flight": N, "by_path": {...}, "keys": {key id: requests},
                                    "issued": N, "refused": N}
  GET /_reset                   -> zero the counters
  GET /_fault?status=503&count=3&match=shard   the next 3 matching requests answer 503
  GET /_fault?stall=5&count=1&match=shard      the next matching request waits 5 s, then answers
  GET /_fault?deny=shard        every matching request answers 403 (until /_fault?clear=1)
  GET /_fault?clear=1           no faults
  GET /_latency?ms=20&bps=0     per-request latency, and a bandwidth cap in bytes/s (0: none)
  GET /_ifmatch?ignore=1        answer as a store that ignores If-Match (some gateways and
                                proxies do): the current bytes, with their own ETag
  GET /_creds?ttl=4&require=1&bearer=T&revoke=1   credentials it issues last 4 s; with require=1 every
                                store request must be signed with issued, unexpired keys and their
                                session token (else 403 ExpiredToken, InvalidAccessKeyId or
                                InvalidToken in an XML body, as AWS answers, counted as
                                "refused"); bearer=T is the token the
                                container and SSO stand-ins want; revoke=1 forgets every key
                                issued so far

Credential stand-ins (also never forwarded), each issuing new keys on every call:
  PUT /latest/api/token, GET /latest/meta-data/iam/security-credentials/[ROLE]   EC2 IMDSv2
                                (a GET without a session token from the PUT answers 401)
  GET /_container               the ECS/EKS container endpoint (Authorization: T)
  GET /federation/credentials   the SSO portal (x-amz-sso_bearer_token: T)
  POST / (STS: AssumeRole, AssumeRoleWithWebIdentity)   forwarded to --upstream (moto's STS);
                                the keys in its answer count as issued; /_stats lists the actions
                                ("sts") and the key that signed each ("sts_signers")

Prints "PORT <n>" on stdout once listening (port 0 picks a free one).
"""

import argparse
import datetime
import email.utils
import re
import secrets
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATS = {"requests": 0, "gets": 0, "heads": 0, "lists": 0, "bytes": 0, "by_path": {}, "max_in_flight": 0, "connections": 0,
         "keys": {}, "issued": 0, "refused": 0}
IN_FLIGHT = [0]
FAULTS = {"status": None, "stall": None, "count": 0, "match": "", "deny": None}
LATENCY = {"ms": 0.0, "bps": 0}
IF_MATCH = {"ignore": False}
CREDS = {"ttl": 3600.0, "require": False, "bearer": "", "imds_tokens": set()}
# Issued key id -> (session token, expiry as a Unix time).
ISSUED = {}


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def issue():
    """New keys, valid for CREDS["ttl"] seconds."""
    with LOCK:
        STATS["issued"] += 1
        key = "ASIAPACKFS%06d" % STATS["issued"]
        token = "tok-" + secrets.token_hex(16)
        expires = time.time() + CREDS["ttl"]
        ISSUED[key] = (token, expires)
    return key, "secret-" + secrets.token_hex(8), token, expires


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
                STATS.update(requests=0, gets=0, heads=0, lists=0, bytes=0, by_path={}, max_in_flight=0, connections=0,
                             keys={}, refused=0)
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
            elif path == "/_creds":
                if "ttl" in q:
                    CREDS["ttl"] = float(q["ttl"])
                if "require" in q:
                    CREDS["require"] = q["require"] == "1"
                if "bearer" in q:
                    CREDS["bearer"] = q["bearer"]
                if "revoke" in q:
                    ISSUED.clear()
                body = json.dumps({k: v for k, v in CREDS.items() if k != "imds_tokens"}).encode()
            elif path == "/_ifmatch":
                IF_MATCH["ignore"] = q.get("ignore") == "1"
                body = json.dumps(IF_MATCH).encode()
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

    def send_json(self, status, doc, headers=None, raw=None):
        body = raw if raw is not None else json.dumps(doc).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def check_signature(self, query):
        """The S3 error code for a request whose keys are not good now, or None."""
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}
        cred = q.get("X-Amz-Credential", "")
        if not cred:
            m = re.search(r"Credential=([^/,\s]+)/", self.headers.get("Authorization", ""))
            cred = m.group(1) if m else ""
        key = cred.split("/")[0]
        token = q.get("X-Amz-Security-Token") or self.headers.get("X-Amz-Security-Token")
        with LOCK:
            if key:
                STATS["keys"][key] = STATS["keys"].get(key, 0) + 1
            if not CREDS["require"]:
                return None
            if key not in ISSUED:
                return "InvalidAccessKeyId"
            issued_token, expires = ISSUED[key]
            if token != issued_token:
                return "InvalidToken"
            if time.time() >= expires:
                return "ExpiredToken"
        return None

    def credentials(self, path):
        """The IMDSv2, container and SSO portal stand-ins."""
        if path == "/latest/api/token":
            if self.command != "PUT" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self.send_json(400, {}, raw=b"")
            session = secrets.token_hex(12)
            with LOCK:
                CREDS["imds_tokens"].add(session)
            return self.send_json(200, None, raw=session.encode())
        if path.startswith("/latest/meta-data/iam/security-credentials/"):
            if self.headers.get("X-aws-ec2-metadata-token") not in CREDS["imds_tokens"]:
                return self.send_json(401, {}, raw=b"")
            role = path[len("/latest/meta-data/iam/security-credentials/"):]
            if not role:
                return self.send_json(200, None, raw=b"packfs-test-role")
            if role != "packfs-test-role":
                return self.send_json(404, {}, raw=b"")
            key, secret, token, expires = issue()
            return self.send_json(200, {"Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": key,
                                        "SecretAccessKey": secret, "Token": token, "Expiration": iso(expires),
                                        "LastUpdated": iso(time.time())})
        if path == "/_container":
            if not CREDS["bearer"] or self.headers.get("Authorization") != CREDS["bearer"]:
                return self.send_json(403, {"message": "bad token"})
            key, secret, token, expires = issue()
            return self.send_json(200, {"AccessKeyId": key, "SecretAccessKey": secret, "Token": token,
                                        "Expiration": iso(expires)})
        # The SSO portal.
        if not CREDS["bearer"] or self.headers.get("x-amz-sso_bearer_token") != CREDS["bearer"]:
            return self.send_json(401, {"message": "Session token not found or invalid"})
        key, secret, token, expires = issue()
        return self.send_json(200, {"roleCredentials": {"accessKeyId": key, "secretAccessKey": secret,
                                                        "sessionToken": token, "expiration": int(expires * 1000)}})

    def sts(self):
        """STS, forwarded to moto; the keys it hands out count as issued."""
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        up = urllib.parse.urlsplit(ARGS.upstream or "")
        if not up.hostname:
            return self.send_json(501, {}, raw=b"<ErrorResponse><Error><Code>NoUpstream</Code></Error></ErrorResponse>")
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        conn.request("POST", "/", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        text = data.decode("utf-8", "replace")
        key = re.search(r"<AccessKeyId>([^<]+)</AccessKeyId>", text)
        token = re.search(r"<SessionToken>([^<]+)</SessionToken>", text)
        if resp.status == 200 and key and token:
            with LOCK:
                STATS["issued"] += 1
                ISSUED[key.group(1)] = (token.group(1), time.time() + 3600)
        signer = re.search(r"Credential=([^/,\s]+)/", self.headers.get("Authorization", ""))
        with LOCK:
            STATS.setdefault("sts", [])
            STATS["sts"].append(dict(urllib.parse.parse_qsl(body.decode())).get("Action", ""))
            # The keys that signed STS calls (AssumeRole), apart from the store's.
            STATS.setdefault("sts_signers", [])
            STATS["sts_signers"].append(signer.group(1) if signer else None)
        return self.send_json(resp.status, None, {"Content-Type": "text/xml"}, raw=data)

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
        if path.startswith("/_") and path != "/_container":
            return self.control(path, parsed.query)
        if path.startswith("/latest/") or path in ("/_container", "/federation/credentials"):
            return self.credentials(path)
        if self.command == "POST" and path == "/":
            return self.sts()
        refused = self.check_signature(parsed.query)
        if refused:
            with LOCK:
                STATS["refused"] += 1
            # As AWS answers: the code in the XML body only (so HEAD says nothing).
            body = ("<Error><Code>%s</Code><Message>refused</Message></Error>" % refused).encode()
            return self.send_json(403, None, {"Content-Type": "application/xml"}, raw=body)
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
        if match and match != etag and not IF_MATCH["ignore"]:
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
