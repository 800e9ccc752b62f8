"""Certificates for the TLS tests, made by the test itself with Debian's
`openssl` (P-256 keys, valid two days): a CA, and leaf certificates that CA
signs for a server or a client, with the subjectAltNames given.

    ca = CA.make(dir, "test-ca")
    server = ca.issue(dir, "counter", "IP:127.0.0.1,DNS:counter.test", client=False)
    server.cert, server.key  # PEM files
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL = "openssl"


def _openssl(*args: str | Path) -> None:
    subprocess.run([OPENSSL, *map(str, args)], check=True, capture_output=True, timeout=30)


def _key_args(key: Path) -> list[str | Path]:
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", key]


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key, PEM files."""
    cert: Path
    key: Path

    def der(self) -> bytes:
        """The certificate as DER (what ssl's getpeercert(True) gives)."""
        out = subprocess.run([OPENSSL, "x509", "-in", str(self.cert), "-outform", "DER"],
                             check=True, capture_output=True, timeout=30)
        return out.stdout

    def replace(self, new: "Pair") -> None:
        """Replaces this pair's files with `new`'s contents, each in one
        rename, the certificate first (as a rotation writes them)."""
        for src, dst in ((new.cert, self.cert), (new.key, self.key)):
            tmp = dst.with_name(f".{dst.name}.tmp")
            tmp.write_bytes(src.read_bytes())
            os.replace(tmp, dst)


@dataclass(frozen=True)
class CA(Pair):
    @classmethod
    def make(cls, directory: Path, name: str) -> "CA":
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{name}.crt", directory / f"{name}.key"
        _openssl("req", "-x509", *_key_args(key), "-out", cert, "-days", "2",
                 "-subj", f"/CN={name}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return cls(cert, key)

    def issue(self, directory: Path, name: str, san: str, client: bool) -> Pair:
        """A leaf certificate for `name` with subjectAltName `san` (e.g.
        "IP:127.0.0.1,DNS:counter.test"), for a client or a server."""
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{name}.crt", directory / f"{name}.key"
        csr, ext = directory / f"{name}.csr", directory / f"{name}.ext"
        ext.write_text(f"subjectAltName={san}\n"
                       "basicConstraints=critical,CA:FALSE\n"
                       "keyUsage=critical,digitalSignature\n"
                       f"extendedKeyUsage={'clientAuth' if client else 'serverAuth'}\n")
        _openssl("req", "-new", *_key_args(key), "-out", csr, "-subj", f"/CN={name}")
        _openssl("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key,
                 "-CAcreateserial", "-days", "2", "-out", cert, "-extfile", ext)
        return Pair(cert, key)
