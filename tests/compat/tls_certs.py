"""Test certificates made with the openssl CLI into a temporary directory (never committed).

    certs = Certs(tmpdir)
    ca = certs.ca("test-ca")                                   # {"cert": path, "key": path}
    server = certs.leaf(ca, "localhost", san="DNS:localhost,IP:127.0.0.1")
    client = certs.leaf(ca, "alice")                           # client certificate, CN alice

EC P-256 keys (fast to make), PKCS#8 PEM, v3 extensions that rustls/webpki, OpenSSL (the C++
client) and Go's crypto/tls all accept.
"""

import os
import subprocess
import uuid

CA_CONFIG = """[req]
distinguished_name = dn
prompt = no
[dn]
CN = %s
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
"""

LEAF_EXTENSIONS = """basicConstraints = CA:FALSE
extendedKeyUsage = serverAuth,clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = %s
"""


def _run(args, cwd):
    proc = subprocess.run(["openssl"] + args, cwd=cwd, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    assert proc.returncode == 0, "openssl %s failed:\n%s" % (" ".join(args), proc.stdout.decode())


class Certs:
    def __init__(self, directory):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)

    def _path(self, name):
        return os.path.join(self.dir, name)

    def ca(self, name):
        """A self-signed CA called `name`."""
        config = self._path(name + ".cnf")
        with open(config, "w") as f:
            f.write(CA_CONFIG % name)
        cert, key = self._path(name + ".pem"), self._path(name + ".key")
        _run(["req", "-x509", "-config", config, "-extensions", "v3_ca", "-newkey", "ec",
              "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
              "-days", "2"], self.dir)
        return {"cert": cert, "key": key}

    def leaf(self, ca, cn, san="DNS:localhost,IP:127.0.0.1", name=None):
        """A certificate for subject CN `cn` with SAN `san`, signed by `ca`."""
        name = name or "%s-%s" % (cn, uuid.uuid4().hex[:8])
        key, csr, cert = (self._path(name + ext) for ext in (".key", ".csr", ".pem"))
        ext = self._path(name + ".ext")
        with open(ext, "w") as f:
            f.write(LEAF_EXTENSIONS % san)
        _run(["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
              "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=%s" % cn], self.dir)
        _run(["x509", "-req", "-in", csr, "-CA", ca["cert"], "-CAkey", ca["key"],
              "-set_serial", str(int(uuid.uuid4().hex[:15], 16)), "-days", "2", "-out", cert,
              "-extfile", ext], self.dir)
        return {"cert": cert, "key": key}

    def leaf_v1(self, ca, cn, name=None):
        """An X.509 version 1 certificate (no extensions, as `openssl x509 -req` without an
        extensions file makes them, and older CAs issue) for subject CN `cn`, signed by `ca`."""
        name = name or "%s-v1-%s" % (cn, uuid.uuid4().hex[:8])
        key, csr, cert = (self._path(name + ext) for ext in (".key", ".csr", ".pem"))
        _run(["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
              "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=%s" % cn], self.dir)
        _run(["x509", "-req", "-in", csr, "-CA", ca["cert"], "-CAkey", ca["key"],
              "-set_serial", str(int(uuid.uuid4().hex[:15], 16)), "-days", "2", "-out", cert],
             self.dir)
        return {"cert": cert, "key": key}
