"""NeMo's own decoding tests, vendored, run as NeMo wrote them and with our strategies substituted (README.md).

A package, so that its conftest is imported as ``nemo_upstream.conftest`` and never shadows ``tests/conftest.py``
(the project's tests import helpers from that module by the name ``conftest``).
"""
