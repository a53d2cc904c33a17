"""Helpers of the authentication tests: keys and tokens made by `magnetar tokens` (the binary
under test), hand-made JWTs (expired, forged), and a broker of the test's own with
`[authentication]` on."""

import base64
import hashlib
import hmac
import json
import os
import subprocess
import time

import conftest

TOKENS_TIMEOUT_S = 60


def magnetar(*args):
    """Runs `magnetar ARGS` (the binary under test); returns stdout, asserts exit 0."""
    proc = subprocess.run([conftest.magnetar_binary()] + [str(a) for a in args],
                          capture_output=True, timeout=TOKENS_TIMEOUT_S)
    assert proc.returncode == 0, "magnetar %s: %s" % (" ".join(map(str, args)), proc.stderr[-2000:])
    return proc.stdout


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256(secret, claims, header=None):
    """An HS256 JWT made here (to craft expired or forged tokens)."""
    head = b64url(json.dumps(header or {"alg": "HS256"}).encode())
    body = b64url(json.dumps(claims).encode())
    signing = ("%s.%s" % (head, body)).encode()
    sig = b64url(hmac.new(secret, signing, hashlib.sha256).digest())
    return "%s.%s.%s" % (head, body, sig)


class Keys:
    """A secret key and an RSA key pair made by `magnetar tokens` in `directory`."""

    def __init__(self, directory):
        self.dir = directory
        self.secret_path = os.path.join(directory, "secret.key")
        self.private_path = os.path.join(directory, "private.key")
        self.public_path = os.path.join(directory, "public.key")
        magnetar("tokens", "create-secret-key", "--output", self.secret_path)
        magnetar("tokens", "create-key-pair", "--output-private-key", self.private_path,
                 "--output-public-key", self.public_path)
        with open(self.secret_path, "rb") as f:
            self.secret = f.read()

    def hs_token(self, subject, expiry=None):
        args = ["tokens", "create", "--secret-key", "file://" + self.secret_path,
                "--subject", subject]
        if expiry:
            args += ["--expiry-time", expiry]
        return magnetar(*args).decode().strip()

    def rs_token(self, subject, expiry=None):
        args = ["tokens", "create", "--private-key", "file://" + self.private_path,
                "--subject", subject]
        if expiry:
            args += ["--expiry-time", expiry]
        return magnetar(*args).decode().strip()

    def secret_toml(self, extra=""):
        return ("[authentication]\nenabled = true\ntoken_secret_key = \"file://%s\"\n%s"
                % (self.secret_path, extra))

    def public_toml(self, extra=""):
        return ("[authentication]\nenabled = true\ntoken_public_key = \"file://%s\"\n%s"
                % (self.public_path, extra))


def bearer(token):
    return {"Authorization": "Bearer " + token}


def expired_hs(secret, subject="alice"):
    return hs256(secret, {"sub": subject, "exp": int(time.time()) - 60})
