"""A local httpbin for a task's tests: http and https on one port of the sandbox's loopback.

This file is data to farm: ``farm.tasks.venvs`` writes it into the httpbin venv that its
``farm-httpbin`` step makes (``.venv/httpbin``, httpbin and cryptography from PyPI, apart from
the code under test); farm never imports it. It runs in that venv: Python 3.7+.

requests' tests up to 2.8 call httpbin at ``HTTPBIN_URL`` (default http://httpbin.org/), and
some of them the same host over https (``test_mixed_case_scheme_acceptable`` sends
``HTTPS://`` + the host of ``HTTPBIN_URL``). SWE-bench's harness ran them against
httpbin.org; a sandbox has no network. So httpbin answers on a free port of the loopback,
both ways: a connection whose first byte opens a TLS handshake is wrapped with a certificate
for ``localhost`` made at setup (``--make-cert``), which the setup appends to the CA bundle the
tests trust. ``python serve.py`` starts the server in the background and prints its URL
(``http://localhost:PORT/``) once it accepts connections.

Some tests name httpbin.org itself (``requests.get('https://httpbin.org/redirect/5')``), or
redirect to another host only to see what requests sends there (``www.google.co.uk``).
``--hosts-shim DIR`` writes a module and a ``.pth`` into the test venv's site-packages (DIR) that
resolve those names (``SHIMMED_HOSTS``) to this server while ``HTTPBIN_URL`` names it:
``socket.getaddrinfo`` of such a host gives the loopback and the server's port, whatever port
was asked; the certificate names them too. Every other host resolves as before (in a sandbox:
not at all).
"""

import datetime
import ipaddress
import os
import socket
import ssl
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CERT, KEY = os.path.join(HERE, "cert.pem"), os.path.join(HERE, "key.pem")
# httpbin.org itself; and the host requests' tests send an off-host redirect to (2.x's
# test_auth_is_stripped_on_redirect_off_host), which needs only an answer from another host name
SHIMMED_HOSTS = ("httpbin.org", "www.httpbin.org", "www.google.co.uk")

# the test venv's module (any Python 3): imported at its interpreter's start by the .pth
SHIM = '''"""farm: httpbin.org (and the host the tests redirect off to) resolves to the sandbox's
local httpbin while HTTPBIN_URL names it (SWE-bench's harness ran these tests online; a sandbox
has no network)."""
import os
import socket

_HOSTS = %r
_getaddrinfo = socket.getaddrinfo


def getaddrinfo(host, port, *args, **kwargs):
    name = host.decode("ascii", "replace") if isinstance(host, bytes) else host
    url = os.environ.get("HTTPBIN_URL", "")
    if isinstance(name, str) and name.lower().rstrip(".") in _HOSTS and url.startswith("http://localhost:"):
        return _getaddrinfo("127.0.0.1", int(url.rstrip("/").rsplit(":", 1)[1]), *args, **kwargs)
    return _getaddrinfo(host, port, *args, **kwargs)


socket.getaddrinfo = getaddrinfo
'''


def hosts_shim(site_packages):
    with open(os.path.join(site_packages, "farm_httpbin_hosts.py"), "w") as f:
        f.write(SHIM % (SHIMMED_HOSTS,))
    with open(os.path.join(site_packages, "farm_httpbin_hosts.pth"), "w") as f:
        f.write("import farm_httpbin_hosts\n")


def make_cert():
    # heavy: cryptography
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        *[x509.DNSName(h) for h in SHIMMED_HOSTS],
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    with open(KEY, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                  serialization.NoEncryption()))
    with open(CERT, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))


def serve(port):
    # heavy: httpbin, werkzeug
    from httpbin import app
    from werkzeug.serving import ThreadedWSGIServer

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(CERT, KEY)

    class EitherWay(ThreadedWSGIServer):
        def get_request(self):
            sock, addr = self.socket.accept()
            sock.settimeout(10)  # a client that connects and says nothing does not hold the others up
            try:
                tls = sock.recv(1, socket.MSG_PEEK) == b"\x16"  # a TLS handshake's first byte
                if tls:
                    sock = context.wrap_socket(sock, server_side=True)
            except (OSError, ssl.SSLError):
                pass
            sock.settimeout(None)
            return sock, addr

    EitherWay("127.0.0.1", port, app).serve_forever()


def main(argv):
    if argv[:1] == ["--make-cert"]:
        make_cert()
        return 0
    if argv[:1] == ["--hosts-shim"]:
        hosts_shim(argv[1])
        return 0
    if argv[:1] == ["--serve"]:
        serve(int(argv[1]))
        return 0
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", str(port)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    with open(os.path.join(HERE, "server-%d.pid" % port), "w") as f:  # what stops it, outside a sandbox
        f.write(str(server.pid))
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            break
        except OSError:
            time.sleep(0.1)
    print("http://localhost:%d/" % port)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
