"""`fleetrl certs`: a self-signed certificate set for one fleet (cryptography, no openssl CLI).

    fleetrl certs --out certs/ --hosts 10.0.0.5,10.0.0.6,buffer.lan
    fleetrl train --set security.tls_cert='"certs/fleet.pem"' --set security.tls_key='"certs/fleet.key"' \\
                  --set security.tls_ca='"certs/ca.pem"'

Writes ca.pem (the fleet's CA), ca.key, fleet.pem and fleet.key: one certificate for every
role, valid as server and as client (so `security.tls_client_auth` works with the same
files), naming localhost, 127.0.0.1 and every --hosts entry. Keys are written 0600.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fleetrl"), x509.NameAttribute(NameOID.COMMON_NAME, common)]
    )


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for host in ["localhost", "127.0.0.1", *hosts]:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            entries.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(entries)


def _write(path: pathlib.Path, data: bytes, private: bool) -> None:
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def make_certs(out: str | os.PathLike, hosts: list[str], days: int = 365) -> dict[str, pathlib.Path]:
    """Create the CA and the fleet certificate in `out`; returns the four paths by name."""
    if days < 1:
        raise ValueError(f"--days ({days}) must be >= 1")
    folder = pathlib.Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("fleetrl CA"))
        .issuer_name(_name("fleetrl CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fleetrl fleet"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(_san(hosts), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = {name: folder / name for name in ("ca.pem", "ca.key", "fleet.pem", "fleet.key")}
    _write(paths["ca.pem"], ca.public_bytes(pem), private=False)
    _write(paths["fleet.pem"], cert.public_bytes(pem), private=False)
    for name, private_key in (("ca.key", ca_key), ("fleet.key", key)):
        data = private_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        _write(paths[name], data, private=True)
    return paths


def main(args: argparse.Namespace) -> int:
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    paths = make_certs(args.out, hosts, args.days)
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    print(
        f"use: --set security.tls_cert='\"{paths['fleet.pem']}\"' --set security.tls_key='\"{paths['fleet.key']}\"' "
        f"--set security.tls_ca='\"{paths['ca.pem']}\"'"
    )
    return 0
