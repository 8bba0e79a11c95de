"""A real registry on 127.0.0.1 for the tests and the benchmark: Debian's ``docker-registry``
(the CNCF distribution registry 2.8), started on a free port with a throwaway storage root.

``auth``: None (anonymous), ``"basic"`` (htpasswd users, bcrypt as the registry wants), or
``"token"``: the registry trusts a token service as Docker Hub's works: a 401 names the
service's realm, the client asks it for a JWT with the repository's pull scope (anonymous,
or with a user's password), and the registry checks the token's signature against the
service's certificate. ``TokenService`` is ours (Docker Hub's is not reachable here); it
speaks the same protocol (``GET /token?service=&scope=`` -> ``{"token", "access_token"}``,
RS256 JWTs with an ``x5c`` chain). ``private`` repositories need a user.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.server
import json
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenService:
    """Docker's token protocol on 127.0.0.1, in a thread of this process."""

    def __init__(self, root: Path, *, users: dict[str, str], private: set[str], service: str, issuer: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        self.users, self.private, self.service, self.issuer = users, private, service, issuer
        self.requests: list[dict] = []
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "farm test token service")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self._key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(self._key, hashes.SHA256()))  # fmt: skip
        self.cert_pem = root / "token-cert.pem"
        self.cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self.port = free_port()
        self.realm = f"http://127.0.0.1:{self.port}/token"
        service_self = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                status, body = service_self.answer(query, self.headers.get("Authorization", ""))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def answer(self, query: dict[str, list[str]], authorization: str) -> tuple[int, dict]:
        user = ""
        if authorization.startswith("Basic "):
            name, _, password = base64.b64decode(authorization[6:]).decode().partition(":")
            if self.users.get(name) != password:
                return 401, {"details": "incorrect username or password"}
            user = name
        scope = (query.get("scope") or [""])[0]
        self.requests.append({"user": user, "scope": scope, "service": (query.get("service") or [""])[0]})
        access = []
        if scope.startswith("repository:"):
            _, repo, actions = scope.split(":", 2)
            if user:  # a user may do what it asks (push the test images)
                access.append({"type": "repository", "name": repo, "actions": actions.split(",")})
            elif repo not in self.private:  # anonymous: pull public repositories, as Docker Hub
                access.append({"type": "repository", "name": repo, "actions": ["pull"]})
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": user, "aud": self.service, "exp": now + 300, "nbf": now - 30,
                  "iat": now, "jti": secrets.token_hex(8), "access": access}  # fmt: skip
        token = self._sign(claims)
        return 200, {"token": token, "access_token": token, "expires_in": 300}

    def _sign(self, claims: dict) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        header = {"typ": "JWT", "alg": "RS256", "x5c": [self._x5c]}
        signing = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        sig = self._key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing}.{_b64(sig)}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class LocalRegistry:
    """``docker-registry serve`` on 127.0.0.1:<free port>; ``stop()`` (or ``with``) ends it."""

    def __init__(
        self, root: Path, *, auth: str | None = None, users: dict[str, str] | None = None,
        private: set[str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.auth = auth
        self.users = users or {}
        self.private = private or set()
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        self.tokens: TokenService | None = None
        self._proc: subprocess.Popen | None = None

    def start(self) -> LocalRegistry:
        exe = shutil.which("docker-registry")
        if exe is None:
            raise RuntimeError("docker-registry is not installed (apt-get install docker-registry; scripts/setup.sh does)")
        self.root.mkdir(parents=True, exist_ok=True)
        lines = ["version: 0.1", "log:", "  level: error", "storage:",
                 f"  filesystem: {{rootdirectory: {self.root / 'data'}}}", "  delete: {enabled: true}",
                 "http:", f"  addr: {self.host}", f"  secret: {secrets.token_hex(16)}"]  # fmt: skip
        if self.auth == "basic":
            import warnings

            with warnings.catch_warnings():  # bcrypt through libxcrypt: the registry reads only bcrypt lines
                warnings.simplefilter("ignore", DeprecationWarning)
                import crypt as _crypt

            htpasswd = self.root / "htpasswd"
            htpasswd.write_text("".join(f"{u}:{_crypt.crypt(p, _crypt.mksalt(_crypt.METHOD_BLOWFISH, rounds=16))}\n"
                                        for u, p in self.users.items()))  # fmt: skip
            lines += ["auth:", "  htpasswd:", "    realm: farm-test", f"    path: {htpasswd}"]
        elif self.auth == "token":
            self.tokens = TokenService(self.root, users=self.users, private=self.private, service="farm-test-registry",
                                       issuer="farm-test-issuer")  # fmt: skip
            lines += ["auth:", "  token:", f"    realm: {self.tokens.realm}", "    service: farm-test-registry",
                      "    issuer: farm-test-issuer", f"    rootcertbundle: {self.tokens.cert_pem}"]  # fmt: skip
        config = self.root / "config.yml"
        config.write_text("\n".join(lines) + "\n")
        self._log = open(self.root / "registry.log", "wb")
        self._proc = subprocess.Popen([exe, "serve", str(config)], stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {(self.root / 'registry.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.url}/v2/", timeout=2)
                return self
            except urllib.error.HTTPError:
                return self  # 401: up, and asking for auth
            except OSError:
                time.sleep(0.05)  # poll: the loop's deadline bounds the wait
        self.stop()
        raise RuntimeError("docker-registry did not answer within 30 s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        if self._proc is not None:
            self._log.close()
        self._proc = None
        if self.tokens is not None:
            self.tokens.stop()

    def requests(self, what: str = "") -> list[tuple[str, str, int]]:
        """(method, path, status) of every request the registry logged whose path holds ``what``."""
        out = []
        for line in (self.root / "registry.log").read_text(errors="replace").splitlines():
            m = re.search(r'"(GET|HEAD|PUT|POST|PATCH|DELETE) (\S+) HTTP/[\d.]+" (\d{3})', line)
            if m and what in m.group(2):
                out.append((m.group(1), m.group(2), int(m.group(3))))
        return out

    def blob_file(self, digest: str) -> Path:
        """Where the registry keeps a blob on disk (to corrupt it in a test)."""
        hexd = digest.split(":", 1)[1]
        return self.root / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
