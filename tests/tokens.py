"""Tokens for Envoy's own jwt_authn, signed here (ES256, PyJWT), and the
filter that verifies them with a local JWKS (tests/test_jwt.py,
tests/test_tenant_logged.py). A verified payload lands in the request's
dynamic metadata, where the filter's `tenant_source` reads CLAIM_PATH."""

from __future__ import annotations

import base64
import json
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

import harness

ISSUER = "https://issuer.test"
KID = "test-key"
CLAIM_PATH = ["metadata", "filter_metadata", "envoy.filters.http.jwt_authn", "jwt_payload", "tenant"]


def _b64(n: int) -> str:
    return base64.urlsafe_b64encode(n.to_bytes(32, "big")).rstrip(b"=").decode()


def jwks(key: ec.EllipticCurvePrivateKey) -> str:
    pub = key.public_key().public_numbers()
    return json.dumps({"keys": [{"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig",
                                 "kid": KID, "x": _b64(pub.x), "y": _b64(pub.y)}]})


def token(key: ec.EllipticCurvePrivateKey, tenant: str) -> str:
    claims = {"iss": ISSUER, "sub": "user-1", "tenant": tenant, "exp": int(time.time()) + 3600}
    return jwt.encode(claims, key, algorithm="ES256", headers={"kid": KID})


def jwt_authn(key: ec.EllipticCurvePrivateKey, *, to_header: bool, allow_missing: bool) -> dict:
    provider = {"issuer": ISSUER, "local_jwks": {"inline_string": jwks(key)}}
    if to_header:
        provider["claim_to_headers"] = [{"header_name": harness.TENANT_HEADER, "claim_name": "tenant"}]
    else:
        provider["payload_in_metadata"] = "jwt_payload"
    requires = {"provider_name": "issuer"}
    if allow_missing:
        requires = {"requires_any": {"requirements": [requires, {"allow_missing": {}}]}}
    return {
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
            "providers": {"issuer": provider},
            "rules": [{"match": {"prefix": "/"}, "requires": requires}],
        },
    }
