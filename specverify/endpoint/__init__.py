"""Audits of a running OpenAI-compatible server over HTTP: ``check_endpoint`` and its parts."""

from __future__ import annotations

from specverify.core.lazy import lazy_getattr

_LAZY = {
    "check_endpoint": "specverify.endpoint.checks",
    "EndpointError": "specverify.endpoint.http",
    "HttpClient": "specverify.endpoint.http",
    "SampleStore": "specverify.endpoint.store",
    "Sampling": "specverify.endpoint.api",
}

__all__ = list(_LAZY)

__getattr__ = lazy_getattr("specverify.endpoint", _LAZY, globals())


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
