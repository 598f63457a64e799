"""TLS blocks of ``local`` and ``address`` profiles (``ca_file``, ``cert``, ``key``,
``require_encryption``): :func:`check_tls` validates one (files exist and load, cert and key are a
pair, a TLS handshake in memory succeeds), :func:`make_security` turns it into a
``distributed.security.Security``. Used by :mod:`pgmflow.core.cluster`.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from pgmflow.core.errors import ConfigError

TLS_KEYS = ("ca_file", "cert", "key", "require_encryption")


def _unknown(field_prefix: str, key: str, value, known) -> ConfigError:
    near = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
    hint = f"did you mean {near[0]}?" if near else f"known keys: {', '.join(map(str, known))}"
    return ConfigError(f"{field_prefix}.{key}", value, "unknown key", hint)


def check_tls(path: Path, name: str, tls) -> dict:
    """Validate a profile's ``tls:`` block; returns it with absolute certificate paths. Every file must
    exist and be readable, the CA must load as a CA bundle, and cert and key must load as a pair."""
    import ssl

    prefix = f"{path.name}:profiles.{name}.tls"
    if not isinstance(tls, dict):
        raise ConfigError(
            prefix,
            tls,
            "must be a mapping with ca_file, cert and key",
            "write tls: {ca_file: ca.pem, cert: cert.pem, key: key.pem} (see dask_cluster.yaml)",
        )
    for key, value in tls.items():
        if key not in TLS_KEYS:
            raise _unknown(prefix, key, value, TLS_KEYS)
    base = path.parent if path.name != "<built-in>" else Path(os.environ.get("PGMFLOW_ORIG_CWD", os.getcwd()))
    out = {}
    for key in ("ca_file", "cert", "key"):
        v = tls.get(key)
        if key == "key" and v is None:
            continue  # the key may sit in the cert file
        if not isinstance(v, str) or not v:
            raise ConfigError(
                f"{prefix}.{key}", v, "required: the path of a PEM file", f"set tls.{key} in profile {name} of {path}"
            )
        p = Path(os.path.expanduser(v))
        p = (base / p if not p.is_absolute() else p).resolve()
        if not p.is_file():
            raise ConfigError(
                f"{prefix}.{key}",
                v,
                f"no such file (looked at {p})" if not p.exists() else f"{p} is not a regular file",
                f"create it or point tls.{key} of profile {name} at a "
                "PEM file (relative paths start from the cluster file's directory)",
            )
        if not os.access(p, os.R_OK):
            raise ConfigError(
                f"{prefix}.{key}", v, f"{p} is not readable by this user", f"chmod u+r {p} or run pgmflow as its owner"
            )
        out[key] = str(p)
    try:
        ssl.create_default_context(cafile=out["ca_file"])
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(
            f"{prefix}.ca_file",
            tls["ca_file"],
            f"is not a PEM CA certificate ({exc})",
            "point it at the CA certificate that signed the cluster's certificates",
        ) from None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(out["cert"], out.get("key"))
    except (ssl.SSLError, OSError, ValueError) as exc:
        if "key" in out and ("KEY_VALUES_MISMATCH" in str(exc) or "PRIVATE KEY" not in _head(out["key"])):
            raise ConfigError(
                f"{prefix}.key",
                tls["key"],
                f"is not the private key of tls.cert={tls['cert']!r} ({exc})",
                "use the unencrypted PEM private key made together with the certificate "
                "(or the certificate that goes with this key)",
            ) from None
        raise ConfigError(
            f"{prefix}.cert",
            tls["cert"],
            f"does not load as a PEM certificate with its private key ({exc})",
            "use the PEM certificate made for this cluster (and its key in tls.key)",
        ) from None
    problem = _handshake_problem(out["ca_file"], out["cert"], out.get("key"))
    if problem:
        raise ConfigError(
            f"{prefix}.cert",
            tls["cert"],
            f"is refused by a peer that trusts tls.ca_file={tls['ca_file']!r} ({problem})",
            "use a certificate signed by that CA, or point ca_file at the CA that signed the certificate",
        ) from None
    req = tls.get("require_encryption", True)
    if not isinstance(req, bool):
        raise ConfigError(
            f"{prefix}.require_encryption",
            req,
            "must be true or false",
            "set require_encryption: true (refuse unencrypted connections) or false",
        )
    out["require_encryption"] = req
    return out


def _handshake_problem(ca: str, cert: str, key: str | None) -> str | None:
    """Complete a TLS handshake in memory between two peers that both present ``cert`` and trust
    ``ca``, with the settings Dask uses (mutual authentication, no host name check). Returns why it
    failed (a certificate that ``ca`` did not sign, an expired one), or None."""
    import ssl

    def context(side):
        ctx = ssl.SSLContext(side)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_verify_locations(cafile=ca)
        ctx.load_cert_chain(cert, key)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.check_hostname = False
        ctx.verify_flags &= ~ssl.VERIFY_X509_STRICT
        return ctx

    try:
        bios = [ssl.MemoryBIO() for _ in range(4)]
        server = context(ssl.PROTOCOL_TLS_SERVER).wrap_bio(bios[0], bios[1], server_side=True)
        client = context(ssl.PROTOCOL_TLS_CLIENT).wrap_bio(bios[2], bios[3])
        done = {id(server): False, id(client): False}
        for _ in range(20):
            for peer in (client, server):
                if not done[id(peer)]:
                    try:
                        peer.do_handshake()
                        done[id(peer)] = True
                    except ssl.SSLWantReadError:
                        pass
            bios[0].write(bios[3].read())  # client -> server
            bios[2].write(bios[1].read())  # server -> client
            if all(done.values()):
                server.write(b"x")  # TLS 1.3 checks the client's certificate after the handshake
                bios[2].write(bios[1].read())
                client.read(1)
                return None
        return "the handshake did not finish"
    except (ssl.SSLError, OSError) as exc:
        return " ".join(str(exc).split())


def _head(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("ascii", "replace")
    except OSError:
        return ""


def make_security(tls: dict | None):
    """A ``distributed.security.Security`` from a checked tls block (one certificate for every role)."""
    if not tls:
        return None
    from distributed.security import Security

    cert, key = tls["cert"], tls.get("key")
    return Security(
        tls_ca_file=tls["ca_file"],
        tls_client_cert=cert,
        tls_client_key=key,
        tls_scheduler_cert=cert,
        tls_scheduler_key=key,
        tls_worker_cert=cert,
        tls_worker_key=key,
        require_encryption=bool(tls.get("require_encryption", True)),
    )
